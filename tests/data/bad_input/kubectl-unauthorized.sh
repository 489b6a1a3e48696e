#!/bin/sh
echo "error: You must be logged in to the server (Unauthorized)" >&2
exit 1
