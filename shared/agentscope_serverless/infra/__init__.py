"""Infrastructure definitions shared by the local stack and the deployment templates."""
