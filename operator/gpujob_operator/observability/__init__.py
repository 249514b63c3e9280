"""What the operator tells Prometheus and Grafana about itself and its jobs.

What belongs here: the operator's own ``/metrics`` (job-level series and the operator's
health), the Grafana dashboards and the Prometheus alerting rules generated into the chart.

May import: :mod:`gpujob_operator.api`, :mod:`gpujob_trainer.contract`, the standard
library, prometheus_client and PyYAML. Never kopf, a Kubernetes client, torch,
:mod:`~gpujob_operator.lifecycle`, :mod:`~gpujob_operator.monitoring` or
:mod:`~gpujob_operator.runtime`.
"""
