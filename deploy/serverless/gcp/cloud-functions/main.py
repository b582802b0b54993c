"""Google Cloud Functions entry point: drainer's HTTP handler, deployed from this folder.

    gcloud functions deploy drainer --gen2 --runtime python312 --region REGION \
        --source deploy/serverless/gcp/cloud-functions --entry-point gcf_handler \
        --trigger-http --allow-unauthenticated --timeout 540s \
        --set-env-vars DRAINER_APP=myapp.jobs,DRAINER_HANDLER_BUDGET=540 \
        --set-secrets DRAINER_DATABASE_URL=drainer-database-url:latest,DRAINER_TRIGGER_TOKEN=drainer-trigger-token:latest

The function answers only requests with ``Authorization: Bearer $DRAINER_TRIGGER_TOKEN``
(drainer's trigger sends it), drains for the budget minus a margin and returns the report.
"""

from __future__ import annotations

from drainer.serverless import gcf_handler

__all__ = ["gcf_handler"]
