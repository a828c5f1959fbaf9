"""boxd: a box where AI agents work for their owner, one Linux user and broker per task."""

import os
import sys

from boxd.patches import pydantic as no_plugins_loader

# pydantic loads, at the first model any process builds, every installed distribution's
# `pydantic` entry point. An app is a distribution in boxd's own environment, so one that
# declared such an entry point would run its code in the manager, as root, and in the broker of
# every task, not only in the brokers of tasks that call its tools (boxd.apps.registry). Set
# here, where every boxd process begins, before anything builds a model; boxd uses no plugin.
os.environ["PYDANTIC_DISABLE_PLUGINS"] = "__all__"
# And its loader is one that finds none without reading installed packages' metadata
# (boxd/patches/pydantic.py). Either alone keeps plugins out.
sys.modules.setdefault("pydantic.plugin._loader", no_plugins_loader)
