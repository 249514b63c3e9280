"""Security contexts of the pods and the trainer container (core/v1), with their profiles.

Scalar fields typed and checked (user and group IDs, seccomp and AppArmor profiles, sysctl
names, privilege escalation); SELinux and Windows options copied verbatim.
"""

from __future__ import annotations

import re
from typing import Annotated, ClassVar, Final, Literal, Self

from pydantic import ConfigDict, Field, model_validator

from gpujob_operator.api import rules as R
from gpujob_operator.api.base import Model as _Model
from gpujob_operator.api.base import Passthrough
from gpujob_operator.api.base import Ruled as _Ruled

_ID_MAX: Final = 2147483647
UserID = Annotated[int, Field(ge=0, le=_ID_MAX)]


class Profile(_Ruled):
    """A seccomp or AppArmor profile: Localhost needs localhostProfile, others forbid it."""

    RULES: ClassVar = (
        R.Rule(
            "self.type == 'Localhost' ? (has(self.localhostProfile) && "
            "size(self.localhostProfile) > 0) : !has(self.localhostProfile)",
            "localhostProfile is required for type Localhost and forbidden otherwise",
            lambda m: (
                bool(m.localhost_profile) if m.type == "Localhost" else m.localhost_profile is None
            ),
        ),
    )
    model_config = ConfigDict(json_schema_extra=R.validations(*RULES))

    type: Literal["Unconfined", "RuntimeDefault", "Localhost"] = Field(
        description="Unconfined, RuntimeDefault or Localhost."
    )
    localhost_profile: str | None = Field(
        default=None, max_length=4096, description="Profile on the node, for Localhost."
    )


_SYSCTL_SEGMENT: Final = "[a-z0-9]([-_a-z0-9]*[a-z0-9])?"
_SYSCTL_NAME: Final = f"^({_SYSCTL_SEGMENT}[./])*{_SYSCTL_SEGMENT}$"
SysctlName = Annotated[
    str,
    R.Checked(
        R.str_rule(
            f"self.matches('{_SYSCTL_NAME}')",
            lambda v: re.match(_SYSCTL_NAME, v) is not None,
            "must be a sysctl name such as net.core.somaxconn (lowercase segments separated "
            "by '.' or '/')",
        ),
        max_length=253,
        min_length=1,
    ),
]


class Sysctl(_Model):
    """A namespaced kernel parameter of the pod."""

    name: SysctlName = Field(description="e.g. net.core.somaxconn.")
    value: str = Field(description="Its value.")


class PodSecurityContext(_Model):
    """core/v1 PodSecurityContext: scalar fields typed, nested options verbatim."""

    run_as_user: UserID | None = Field(default=None, description="UID of every container.")
    run_as_group: UserID | None = Field(default=None, description="GID of every container.")
    run_as_non_root: bool | None = Field(default=None, description="Refuse to run as UID 0.")
    fs_group: UserID | None = Field(default=None, description="Group owning the volumes.")
    fs_group_change_policy: Literal["OnRootMismatch", "Always"] | None = Field(
        default=None, description="When to change volume ownership."
    )
    supplemental_groups: list[UserID] | None = Field(
        default=None, max_length=64, description="Extra GIDs of every container."
    )
    supplemental_groups_policy: Literal["Merge", "Strict"] | None = Field(
        default=None, description="Merge with the image's groups, or Strict."
    )
    sysctls: list[Sysctl] | None = Field(
        default=None,
        max_length=64,
        description="Namespaced sysctls of the pod.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )

    @model_validator(mode="after")
    def _unique_sysctls(self) -> Self:
        names = [x.name for x in self.sysctls or ()]
        if len(names) != len(set(names)):
            raise ValueError("spec.template.securityContext.sysctls: duplicate names")
        return self

    seccomp_profile: Profile | None = Field(default=None, description="Seccomp profile.")
    app_armor_profile: Profile | None = Field(default=None, description="AppArmor profile.")
    se_linux_options: Passthrough | None = Field(
        default=None, description="core/v1 SELinuxOptions, verbatim."
    )
    se_linux_change_policy: Literal["MountOption", "Recursive"] | None = Field(
        default=None, description="How SELinux labels are applied to volumes."
    )
    windows_options: Passthrough | None = Field(
        default=None, description="core/v1 WindowsSecurityContextOptions, verbatim."
    )


class Capabilities(_Model):
    """Linux capabilities added to or dropped from the trainer container."""

    add: list[str] | None = Field(default=None, max_length=64, description="e.g. [SYS_PTRACE].")
    drop: list[str] | None = Field(default=None, max_length=64, description="e.g. [ALL].")


def _sys_admin(m: SecurityContext) -> bool:
    return bool(m.capabilities and {"SYS_ADMIN", "CAP_SYS_ADMIN"} & set(m.capabilities.add or ()))


class SecurityContext(_Ruled):
    """core/v1 SecurityContext of the trainer container: scalar fields typed."""

    RULES: ClassVar = (
        R.Rule(
            "!has(self.allowPrivilegeEscalation) || self.allowPrivilegeEscalation || "
            "!((has(self.privileged) && self.privileged) || (has(self.capabilities) && "
            "has(self.capabilities.add) && self.capabilities.add.exists(c, c == 'SYS_ADMIN' "
            "|| c == 'CAP_SYS_ADMIN')))",
            "spec.template.containerSecurityContext: allowPrivilegeEscalation false "
            "contradicts privileged true or capability SYS_ADMIN",
            lambda m: (
                m.allow_privilege_escalation is not False or not (m.privileged or _sys_admin(m))
            ),
        ),
    )
    model_config = ConfigDict(json_schema_extra=R.validations(*RULES))

    privileged: bool | None = Field(default=None, description="Run privileged.")
    allow_privilege_escalation: bool | None = Field(
        default=None, description="Whether a process may gain more privileges (no_new_privs)."
    )
    capabilities: Capabilities | None = Field(default=None, description="Capabilities.")
    run_as_user: UserID | None = Field(default=None, description="UID of the trainer.")
    run_as_group: UserID | None = Field(default=None, description="GID of the trainer.")
    run_as_non_root: bool | None = Field(default=None, description="Refuse to run as UID 0.")
    read_only_root_filesystem: bool | None = Field(
        default=None, description="Mount the image read-only."
    )
    proc_mount: Literal["Default", "Unmasked"] | None = Field(
        default=None, description="/proc masking (Unmasked needs hostUsers false)."
    )
    seccomp_profile: Profile | None = Field(default=None, description="Seccomp profile.")
    app_armor_profile: Profile | None = Field(default=None, description="AppArmor profile.")
    se_linux_options: Passthrough | None = Field(
        default=None, description="core/v1 SELinuxOptions, verbatim."
    )
    windows_options: Passthrough | None = Field(
        default=None, description="core/v1 WindowsSecurityContextOptions, verbatim."
    )
