"""boxd: a box where AI agents work for their owner, one Linux user and broker per task."""

import os
import sys

from boxd.startup import late_ssl, pydantic_no_plugins

# Before anything imports asyncio: it comes without ssl, which is loaded on its first import
# (boxd/startup/late_ssl.py says why and how).
late_ssl.import_asyncio_without_ssl()

# pydantic loads, at the first model any process builds, every installed distribution's
# `pydantic` entry point. An app is a distribution in boxd's own environment, so one that
# declared such an entry point would run its code in the manager, as root, and in the broker of
# every task, not only in the brokers of tasks that call its tools (boxd.apps.registry). Set
# here, where every boxd process begins, before anything builds a model; boxd uses no plugin.
os.environ["PYDANTIC_DISABLE_PLUGINS"] = "__all__"
# And its loader is one that finds none without importing importlib.metadata (1.9 MiB of every
# broker that runs a tool). Either alone keeps plugins out.
sys.modules.setdefault("pydantic.plugin._loader", pydantic_no_plugins)
