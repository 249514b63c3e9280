"""A profile of a job's ranks: each rank's ``/debug/profile`` state read, compared, written
down (pure).

What belongs here: ``profiledoc`` (one rank's untrusted state document parsed into a small,
checked model, or an error that says what was wrong) and ``profilecompare`` (the ranks
compared: the slowest by busy time per step against the lower median, the operation that
differs most between them, the one-line answer, the ConfigMap's text and the
``status.profile`` record). The fetch itself is the scraper's (``fetch_all``), the request
is :mod:`gpujob_operator.api.profile`'s, and the polling is the runtime's (and ``gpujob
diagnose --profile``'s).

May import: :mod:`gpujob_operator.monitoring.scrape` for what a scrape is about (its
targets), :mod:`gpujob_operator.api`, :mod:`gpujob_trainer.contract` and the standard
library. Never the window, the verdicts or the monitor.
"""
