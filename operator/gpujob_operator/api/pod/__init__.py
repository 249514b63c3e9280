"""The pod-facing part of the GPUTrainingJob spec: what the operator copies into the pods.

Env, resources and ``spec.template``: every core/v1 pod field but the operator's own. The
areas users get wrong most (labels, tolerations, affinity, volumes, security contexts, env,
resources) are typed after core/v1 and checked by CEL rules in the CRD (so ``kubectl
apply`` refuses, naming the field, even with the operator down) and by their pydantic twins
(:mod:`gpujob_operator.api.rules`), which also serve offline (``gpujob diagnose --job``).
The rest (further containers, probes, DNS, topology spread, DRA claims ...) passes through
verbatim: the API server checks it on a dry-run pod (the operator's admission webhook) and
at pod creation. One module per area: :mod:`.env`, :mod:`.resources`, :mod:`.placement`
(tolerations, affinity), :mod:`.volumes`, :mod:`.security`, :mod:`.containers` (further
containers and init containers), :mod:`.owned` (the fields the operator owns, refused by
name with the reason), and :mod:`.template`, the ``spec.template`` model that composes them.
:mod:`gpujob_operator.api.spec` holds the job's spec around them and
:mod:`gpujob_operator.api` re-exports the public ones.

Where each core/v1 field the operator copies into the pods is checked, and why:

* At admission, by CEL in the CRD and the twin predicates here (so `kubectl apply` refuses
  with a message naming the field): everything whose core/v1 rules are closed and small —
  names, label keys and values, quantities, tolerations, env and its sources, volume and
  mount names and paths, affinity operators, value counts, weights and topology keys, the
  security contexts' fields and profiles. Typed models make the schema structural, so a
  misspelt key is refused too.
* At apply, by the operator's admission webhook, and again at pod creation (the operator's
  server-side dry run of the built pods, at run time): everything that passes through, the
  inside of each volume source (30 kinds, each with its own rules that change with the
  release), SELinux and Windows options, label values inside affinity selectors, and
  whatever depends on other objects or on cluster policy (ServiceAccounts, PriorityClasses,
  quotas, LimitRanges, Pod Security; the webhook refuses only what can never pass and warns
  about what may change before the job starts, such as a missing ServiceAccount or a full
  quota). Copying those into CEL would drift from the server
  and exceed the CRD's CEL cost budget (the API server refuses a CRD whose estimated rule
  cost is too high: each rule's cost times how many list items and map values it runs on).
* A ValidatingAdmissionPolicy shipped by the chart would add nothing: it runs the same CEL
  over the same object, but only where the chart is installed, while the CRD's rules hold
  wherever the CRD is.
"""
