"""What the draft service and the target verifier share: data plane and control server."""
