"""`boxd doctor`: what boxd needs of this machine, checked, and the manager's gate on it."""
