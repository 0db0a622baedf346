"""Server-wide bounds on the work a server takes on at once: images being decoded and
request bodies held in memory."""
