"""Cloud TPU VMs and pod slices through gcloud: the same command on every host, the snapshot shipped there, and
the results and logs fetched back."""
