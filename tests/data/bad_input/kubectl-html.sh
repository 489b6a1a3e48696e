#!/bin/sh
# kubectl behind a login proxy: an HTML page instead of JSON (exit 0)
echo "<html><head><title>Sign in</title></head><body>Please log in</body></html>"
