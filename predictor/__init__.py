"""deepres predictor: turns a training job's description (JobSpec) into its GPU demand (Demand)."""

from predictor.spec import Demand, DemandPredictor, JobSpec, SpecError

__all__ = ["Demand", "DemandPredictor", "JobSpec", "SpecError"]
