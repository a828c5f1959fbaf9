"""Droid, the agent boxd runs for a Droid task: the release boxd pins (release) and its install
(installer, `boxd droid-install`). The manager's view of the install is
boxd/manager/agent_install.py; the worker that runs Droid is boxd/workers/droid/worker.py."""
