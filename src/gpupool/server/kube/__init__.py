"""The Kubernetes cluster backend: gpupool as a secondary scheduler (`spec.schedulerName: gpupool`).

It lists and watches Nodes and Pods on a kube-apiserver (informer.py), turns them into the core's nodes, running
tasks and pending jobs (objects.py, constraints.py), and feeds them to the same SchedulerLoop and `core.run_cycle`
as agents' nodes and jobs (backend.py); binds go back through the Binding subresource, why-pending through the
PodScheduled condition and FailedScheduling events (client.py). The apiserver is the source of truth for placements:
on start the backend rebuilds its view from it. Nothing here imports the `kubernetes` package at module load except
client.py, which only a server started with a kubeconfig loads.
"""
