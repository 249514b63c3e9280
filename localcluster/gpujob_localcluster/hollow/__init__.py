"""Hollow nodes, as Kubemark's hollow kubelets: nodes the real scheduler binds pods to, whose
pods are reported Running and Ready without a container, and whose ranks' ``/metrics`` and
evidence endpoints a few light processes serve from recorded payloads.

``payloads`` renders a rank's answers (pure); ``faults`` reads the fault file and decides what
each pod's ranks do (pure); ``endpoints`` is the light server process; ``kubelet`` registers the
nodes and drives the pods.
"""
