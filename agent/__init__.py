"""The workstation daemon: GPU inventory, job runtimes, discovery (labq.agent)."""
