"""What the operator does with a job's pods, decided without doing it (pure).

What belongs here: the planner (observed pods + the job in, a plan of creates, deletes,
status and Events out) and the policies it is made of, the pods as it observes them, the
builders of the job's pods and headless Service, the restart backoff, and the goodput
ledger with a finished job's summary (where its GPU time went). By subpackage:
:mod:`.gang` (the gang mechanisms: Workload/PodGroup and Kueue's Workload, the dry-run
probe of a gang's quota, what a pod holds as the scheduler counts it), :mod:`.apiserver`
(the classification of the API server's refusals and the admission webhook's judgement of
them, with the pod's field paths mapped back to the job's) and :mod:`.forecast` (the
start-time forecast of waiting gangs: where they fit, when). The planner and its policies
sit over forecast and apiserver, which know nothing of each other, and both over gang.

May import: :mod:`gpujob_operator.api`, :mod:`gpujob_trainer.contract`, the standard library
and pydantic. Never kopf, a Kubernetes client, :mod:`~gpujob_operator.monitoring`,
:mod:`~gpujob_operator.observability` or :mod:`~gpujob_operator.runtime`: the runtime applies
what this package decides.
"""
