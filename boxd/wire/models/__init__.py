"""The pydantic half of boxd's wire (boxd/wire/__init__.py says why it is apart): the manager's,
the gateway's and boxctl's models of tasks, requests, records and settings. A task's broker
imports none of these. Nothing is imported here."""
