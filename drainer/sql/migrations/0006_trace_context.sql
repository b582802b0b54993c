-- The producer's trace context (issue 16, OpenTelemetry): the W3C `traceparent` and
-- `tracestate` of the span that was current when the job was enqueued, as a JSON object
-- (keys traceparent and tracestate), NULL when there was none or tracing is off. The job's
-- span (drainer[otel]) is a child of it. Kept out of the payload, which stays the
-- producer's own. Not copied to the archive table.
ALTER TABLE {jobs} ADD COLUMN IF NOT EXISTS trace_context jsonb;
