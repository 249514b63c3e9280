"""What the operator does with a job's pods, decided without doing it (pure).

What belongs here: the planner (observed pods + the job in, a plan of creates, deletes,
status and Events out) and the policies it is made of, the builders of the job's children
(pods, the headless Service, Workload/PodGroup, Kueue's Workload), the gang mechanisms and
the dry-run probe of a gang's admission, the restart backoff, the classification of the
API server's refusals and the admission webhook's judgement of them (with the pod's
field paths mapped back to the job's), the start-time forecast of waiting gangs (where they fit, when), and
the goodput ledger with a finished job's summary (where its GPU time went).

May import: :mod:`gpujob_operator.api`, :mod:`gpujob_trainer.contract`, the standard library
and pydantic. Never kopf, a Kubernetes client, :mod:`~gpujob_operator.monitoring`,
:mod:`~gpujob_operator.observability` or :mod:`~gpujob_operator.runtime`: the runtime applies
what this package decides.
"""
