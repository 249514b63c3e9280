"""The operator as a running process: the edge where kopf and the Kubernetes API live.

What belongs here: the kopf handlers and start-up, the per-job loop that observes, plans
(:mod:`~gpujob_operator.lifecycle`), scrapes and judges (:mod:`~gpujob_operator.monitoring`)
and applies the result, the admission webhook (served by kopf, dry-running a job's pods at
apply), the Kubernetes client wrapper, peering and the standby guard, the
one settings object read from ``GPUJOB_*`` at start-up, fault points for the chaos tier, and
``main``.

May import: every other package of the operator, kopf and the Kubernetes client. Only
:mod:`gpujob_operator.cli` imports this package.
"""
