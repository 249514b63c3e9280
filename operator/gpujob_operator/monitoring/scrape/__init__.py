"""A rank's ``/metrics`` from the socket to a frame: the untrusted payload's whole path.

What belongs here: the scraper (one pool of kept-alive connections and one bound on scrapes
in flight for every job; the only I/O of :mod:`~gpujob_operator.monitoring`), its small
HTTP/1.1 client that bounds every read, the exposition-format parser, the frame that boils a
payload down to the window's rows, the guard that admits a frame only with the ranks its
endpoint may speak for and plausible values, and what a scrape is about and yields (its
target, its result, why it failed). Nothing here judges a job: the first reader of a frame
is :mod:`~gpujob_operator.monitoring.window`.

May import: :mod:`gpujob_operator.monitoring.rows` (the row layout a frame fills),
:mod:`gpujob_operator.api`, :mod:`gpujob_trainer.contract` and the standard library. Never
the window, the verdicts, the hang evidence or the monitor, which all read what it yields.
"""
