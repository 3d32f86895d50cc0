"""Model checks: the independent reference model, the TLC runner and trace validation."""
