#!/usr/bin/env python3
"""Container health check: exit 0 when the service on this host answers 200 on /readyz.

Standard library only (the slim image has no curl). /readyz is 503 until the model is loaded and
warmed up, and again while draining, so a container is healthy only while it can take requests.
The port is SMSO_PORT (default 8000), as smso-serve reads it.
"""

import os
import sys
import urllib.error
import urllib.request

url = f"http://127.0.0.1:{os.environ.get('SMSO_PORT', '8000')}/readyz"
try:
    with urllib.request.urlopen(url, timeout=float(os.environ.get("SMSO_HEALTH_TIMEOUT", "4"))):
        pass
except urllib.error.HTTPError as error:
    sys.exit(f"healthcheck: {url} answered {error.code} (loading, warming up or draining)")
except (OSError, ValueError) as error:
    sys.exit(f"healthcheck: {url} unreachable: {error}")
