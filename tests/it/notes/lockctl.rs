//! lockctl and notes: `--note`, run's default note, `status --json`, `-v` blocked-by lines.
