"""When will a waiting gang start: the start-time forecast, decided without reading (pure).

What belongs here: ``queueview`` (the cluster as the forecast sees it, read from plain API
objects: pools of GPUs per node or per Kueue ClusterQueue and flavor, the holders with
their ETAs, the waiters in queue order), ``simulation`` (the arithmetic: where and when each
waiter fits, bracketed where an end is unknown) and ``queuestatus`` (forecasts into
``status.gang.startForecast`` patches and Events, written only when they moved, and a
started job's forecast error). The reads and the clock are the runtime's
(:mod:`~gpujob_operator.runtime.forecaster`).

May import: :mod:`gpujob_operator.lifecycle.builders` (the pods a job would create),
:mod:`gpujob_operator.lifecycle.gang` (the gang's objects, what a pod holds),
:mod:`gpujob_operator.api` and the standard library. Never the planner or its policies: a
forecast never decides what a job does.
"""
