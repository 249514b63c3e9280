"""How a job is doing: scrape its ranks, keep a window, judge it (pure but for the scrape).

What belongs here, by subpackage: :mod:`.scrape` (each rank's ``/metrics`` from the socket
to a frame: the only I/O of this package, a bounded HTTP client on loopback or pod IPs, the
exposition-format parser, and the payload guard that keeps a hostile endpoint's CPU, memory
and bytes bounded), :mod:`.verdicts` (the analysis of a window: progress, ETA, throughput,
the bottleneck verdicts and their hysteresis) and :mod:`.hang` (a hung job's evidence,
parsed and compared). Beside them: the row layout (``rows``) and the sliding window of
scrapes (``window``) that the scrape fills and the verdicts read, the per-job monitor that
turns scrapes into status and Events (``monitor``, ``update``), and ``gpujob diagnose``
(``diagnose``), which runs the same code against endpoints a person names. Each imports only
what is below it: diagnose, monitor, update, then verdicts and hang (apart), window, scrape,
rows.

May import: :mod:`gpujob_operator.api`, :mod:`gpujob_trainer.contract`, the standard
library, pydantic and PyYAML. Never kopf, a Kubernetes client, torch,
:mod:`~gpujob_operator.lifecycle`, :mod:`~gpujob_operator.observability` or
:mod:`~gpujob_operator.runtime`.
"""
