"""What the API server answers about a job's children, read and judged (pure: no client here).

What belongs here: ``refusals`` (a refused create or call classified from its status code
and Status body: the condition reason, whether waiting can ever help, the server's message
and its hint of when to retry, and the refused create the planner remembers), ``podreview``
(the admission webhook's decisions: which of a job's pods to dry-run, whether a refusal of
them refuses the job or admits it with a warning, and the webhook's registration object)
and ``podpaths`` (a field path of a built pod, as the server words it, mapped back to the
job's field the user wrote). The calls themselves are the runtime's
(:mod:`~gpujob_operator.runtime.jobloop`, :mod:`~gpujob_operator.runtime.webhook`); what the
planner does about a refusal is :mod:`~gpujob_operator.lifecycle.retries`.

May import: :mod:`gpujob_operator.lifecycle.builders` (the pods a review builds),
:mod:`gpujob_operator.api` and the standard library. Never the planner or its policies,
which read the refusals classified here.
"""
