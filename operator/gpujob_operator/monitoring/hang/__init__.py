"""A hung job's evidence: each rank's ``/debug/evidence`` read, compared and written down (pure).

What belongs here: ``hangdump`` (one rank's untrusted evidence document parsed into a small,
capped model, or an error that says what was wrong), ``hang`` (the ranks' answers compared:
the collective most of them wait in, and who is not where the others are, and where it is
instead) and ``hangtext`` (the ConfigMap's text a person reads, capped in bytes, the ranks
that matter first). The fetch itself is the scraper's (``fetch_all``), the decision to ask
is the stall verdict's, and the capture, once per stall, is the runtime's
(:mod:`~gpujob_operator.runtime.hangcapture`).

May import: :mod:`gpujob_operator.monitoring.scrape` for what a scrape is about (its
targets), :mod:`gpujob_trainer.contract` and the standard library. Never the window, the
verdicts or the monitor: the evidence is judged on its own, not with the metrics.
"""
