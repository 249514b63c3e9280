"""The gang's admission machinery: its scheduling objects, its quota probe, what a pod holds.

What belongs here: ``gang`` (the builders and readers of the objects that admit a gang as a
whole: ``scheduling.k8s.io`` Workload/PodGroup for ``spec.scheduling.gang: Native``, Kueue's
Workload with its admission and eviction read back; which mechanism is in effect),
``gangprobe`` (one pod asking for the whole gang's resources, so a server-side dry run
judges the gang's quota, not each pod's) and ``podholds`` (what a pod holds on its node as
kube-scheduler and the ResourceQuota plugin count it, native sidecars included; the probe
and the start forecast both ask it). Plain dicts in, plain dicts out. What the plan does
with a gang's admission is :mod:`~gpujob_operator.lifecycle.admission`; the reads and
writes of these objects are the runtime's (:mod:`~gpujob_operator.runtime.gangstate`).

May import: :mod:`gpujob_operator.api` and the standard library. Never the planner, its
policies, the builders or the forecast, which all build on it.
"""
