-- Applied before every migration: the schema and the record of applied migrations.
CREATE SCHEMA IF NOT EXISTS {schema};
CREATE TABLE IF NOT EXISTS {migrations} (
  table_name text        NOT NULL,
  version    int         NOT NULL,
  name       text        NOT NULL,
  applied_at timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (table_name, version)
);
