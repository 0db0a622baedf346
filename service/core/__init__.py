"""What every layer of the service shares: its errors, its settings and the model card it reads."""
