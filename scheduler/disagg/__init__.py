"""Prefill/decode disaggregation in the core: each scheduler in a prefill role or a decode role,
as a PD cluster (simulator/cluster/pd.py) runs them. roles.py says SGLang's flow as kept here."""
