//! Configuration: INI files with `[PATHS]`, expansion, includes, secrets and the database overlay.
