"""How a job is doing: scrape its ranks, keep a window, judge it (pure but for the scrape).

What belongs here: the scrape of each rank's ``/metrics`` (the only I/O of this package, a
bounded HTTP client on loopback or pod IPs), the exposition-format parser, the payload
guard that keeps a hostile endpoint's CPU, memory and bytes bounded, the sliding window of
scrapes, the analysis (progress, ETA, throughput, the bottleneck verdicts), the verdicts'
hysteresis, the per-job monitor that turns scrapes into status and Events, and ``gpujob
diagnose``, which runs the same code against endpoints a person names.

May import: :mod:`gpujob_operator.api`, :mod:`gpujob_trainer.contract`, the standard
library, pydantic and PyYAML. Never kopf, a Kubernetes client, torch,
:mod:`~gpujob_operator.lifecycle`, :mod:`~gpujob_operator.observability` or
:mod:`~gpujob_operator.runtime`.
"""
