"""Who may call and with what: polkit and bearer tokens, paired devices, this computer's screen
sessions, and the vault of the owner's secrets."""
