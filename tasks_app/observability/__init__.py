"""What the system says of itself: metrics and the counters behind them, health probes, worker
presence, the operational log, the invariant checker and the per-workflow figures."""
