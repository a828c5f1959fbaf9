"""The MCP relay Droid is given as its `box` server (relay), and the box's tools as MCP tools
(tools). Standard library only, like every worker."""
