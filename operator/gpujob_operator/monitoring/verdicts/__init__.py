"""A job's window judged: progress, ETA, throughput and the bottleneck verdicts (pure).

What belongs here: ``analysis`` (one call per window: it asks each family of verdicts in
turn and combines what they find) and the families themselves (``progress`` with
``targets``, ``stall``, ``steptime`` over ``ranktimes``, ``transfer``, ``dataparallel``,
``computebound`` graded by ``mfu``, ``device``, step-time quantiles in ``latency``), the
verdicts' names, priority, severities and advice (``verdict``), the settings read from the
job's spec (``analysis_settings``), how numbers are written into status (``formatting``) and
the hysteresis that publishes only what holds across evaluations. Arithmetic on the
window's rows only: no clock (``now`` is passed in), no I/O, no scrape.

May import: :mod:`gpujob_operator.monitoring.window` and
:mod:`gpujob_operator.monitoring.rows` (what is judged), :mod:`gpujob_operator.api`,
:mod:`gpujob_trainer.contract` and the standard library. Never the scrape (a verdict reads
the window, never a payload), the hang evidence or the monitor.
"""
