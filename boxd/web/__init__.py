"""The gateway: the HTTP API on 127.0.0.1:7700, a thin translation to D-Bus with no state."""
