"""Ways for the controller to reach a host's agent."""
