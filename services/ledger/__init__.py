"""The quota ledger: owns projects, pools and quotas, and watches usage against quota."""
