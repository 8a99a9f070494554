"""minedraft's Kubernetes operator: MineDraftDeployment and SpeculationPolicy custom resources."""
