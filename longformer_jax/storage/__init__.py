"""Where runs live: local folders and `gs://` buckets through one path library."""
