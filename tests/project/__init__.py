"""The project as a whole: settings, the Dockerfile, the layout's rules, the demo's seeds,
one host run from the Procfile, the embedded mode and the benchmark's own checks."""
