"""PMI: how MPICH-family ranks find each other (stdlib only: served by the agent on every host)."""
