#!/bin/sh
# Started by the Lambda Web Adapter (AWS_LAMBDA_EXEC_WRAPPER=/opt/bootstrap): serve the app on
# $PORT for the adapter, which streams each response back to the Function URL caller.
cd "$(dirname "$0")" || exit 1
export PYTHONPATH="/opt/python:${LAMBDA_TASK_ROOT:-.}:${PYTHONPATH:-}"
exec python3 -m uvicorn agentscope_handler:create --factory --host 127.0.0.1 \
  --port "${PORT:-8080}" --no-access-log --timeout-graceful-shutdown 2
