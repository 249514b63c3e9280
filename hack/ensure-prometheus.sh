#!/usr/bin/env bash
# Make sure a real Prometheus (and promtool) is installed: the dashboard and alert tests
# evaluate every query against one. Installs the Debian package when missing (CI runs as
# root on a fresh machine); prints the binary's path. PROMETHEUS_BIN overrides the lookup.
set -euo pipefail

bin="${PROMETHEUS_BIN:-/usr/bin/prometheus}"
tool="$(dirname "$bin")/promtool"
if [[ -x "$bin" && -x "$tool" ]]; then
  echo "$bin"
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "ensure-prometheus: $bin missing and no apt-get here; install Prometheus (with promtool)" \
    "and set PROMETHEUS_BIN" >&2
  exit 1
fi
sudo=""
if [[ "$(id -u)" != 0 ]]; then
  sudo="sudo"
fi
echo "ensure-prometheus: installing the Debian prometheus package" >&2
# The package's postinst would start a system-wide Prometheus on :9090 where systemd runs;
# the tests start their own on a free loopback port, so keep services from starting.
export DEBIAN_FRONTEND=noninteractive
policy=/usr/sbin/policy-rc.d
if [[ ! -e "$policy" && -z "$sudo" ]]; then
  printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod +x "$policy"
  trap 'rm -f "$policy"' EXIT
fi
# Wait for a concurrent apt/dpkg run (another tool installing something) instead of failing.
lock="-o DPkg::Lock::Timeout=600"
$sudo apt-get $lock update -qq >&2
$sudo apt-get $lock install -y -qq --no-install-recommends prometheus >&2
if [[ ! -x "$bin" || ! -x "$tool" ]]; then
  echo "ensure-prometheus: the prometheus package did not provide $bin and $tool" >&2
  exit 1
fi
echo "$bin"
