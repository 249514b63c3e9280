"""The job dashboard (``gpujob-job``): one job, from its ranks' own /metrics.

Where each rank's step time goes, which rank straggles, what each GPU does. Template
variables: ``datasource``, ``namespace`` and ``job`` (one of each).
"""

from __future__ import annotations

from typing import Any

from gpujob_operator.observability import opfamilies
from gpujob_operator.observability.dashboards.model import (
    RATE,
    Panel,
    Row,
    dashboard,
    datasource_var,
    query_var,
    t,
)
from gpujob_trainer import contract

NS_ONE = 'namespace="$namespace"'
JOB_ONE = f'{NS_ONE}, job_name="$job"'
THROTTLE = "|".join(contract.THROTTLE_REASONS)


def _by_rank(metric: str) -> str:
    return f"sum by (rank) (rate({metric}{{{JOB_ONE}}}[{RATE}]))"


def build() -> dict[str, Any]:
    """One job: where each rank's step time goes, which rank straggles, what each GPU does."""
    steps_per_rank = _by_rank(contract.STEPS.name)
    not_own = "|".join(
        (
            contract.PHASE_DATA_WAIT,
            contract.PHASE_COMM_WAIT,
            contract.PHASE_CHECKPOINT,
            contract.PHASE_EVAL,
        )
    )
    # The phases partition a step, so the ones that are not a wait are the rank's own work.
    own_per_step = (
        f'(sum by (rank) (rate({contract.PHASE_SECONDS.name}{{{JOB_ONE},phase!~"{not_own}"}}'
        f"[{RATE}])) / {steps_per_rank})"
    )
    outside = f"{contract.PHASE_CHECKPOINT}|{contract.PHASE_EVAL}"
    outside_share = (
        f"max by (phase) (sum by (rank, phase) (rate({contract.PHASE_SECONDS.name}"
        f'{{{JOB_ONE},phase=~"{outside}"}}[{RATE}])) / on (rank) group_left '
        f"sum by (rank) (rate({contract.PHASE_SECONDS.name}{{{JOB_ONE}}}[{RATE}])))"
    )
    step_buckets = f"rate({contract.STEP_DURATION.name}_bucket{{{JOB_ONE}}}[{RATE}])"
    overview = Row(
        "Overview",
        [
            Panel(
                "Progress",
                "Steps completed / target steps.",
                [t(f"{opfamilies.JOB_PROGRESS.name}{{{JOB_ONE}}}")],
                kind="gauge",
                unit="percentunit",
                min=0,
                max=1,
                w=4,
                h=5,
            ),
            Panel(
                "ETA",
                "Estimated time to the target step.",
                [t(f"{opfamilies.JOB_ETA.name}{{{JOB_ONE}}}")],
                kind="stat",
                unit="s",
                w=4,
                h=5,
            ),
            Panel(
                "Throughput",
                "Global samples/s over the operator's analysis window.",
                [t(f"{opfamilies.JOB_SAMPLES_RATE.name}{{{JOB_ONE}}}")],
                kind="stat",
                unit="suffix: samples/s",
                w=4,
                h=5,
            ),
            Panel(
                "Phase",
                "The job's display phase.",
                [t(f"{opfamilies.JOB_PHASE.name}{{{JOB_ONE}}} == 1", "{{phase}}", instant=True)],
                kind="stat",
                w=4,
                h=5,
                options={
                    "textMode": "name",
                    "colorMode": "background",
                    "reduceOptions": {"calcs": ["lastNotNull"]},
                },
            ),
            Panel(
                "Bottleneck",
                "Current verdict; status.bottleneck has the evidence and advice.",
                [
                    t(
                        f"{opfamilies.JOB_VERDICT.name}{{{JOB_ONE}}} == 1",
                        "{{verdict}}",
                        instant=True,
                    )
                ],
                kind="stat",
                w=4,
                h=5,
                options={
                    "textMode": "name",
                    "colorMode": "background",
                    "reduceOptions": {"calcs": ["lastNotNull"]},
                },
            ),
            Panel(
                "MFU",
                "Model FLOPs utilisation: model FLOP/s over the GPUs' dense peak at the "
                "training precision (status.progress.mfu; absent with the reason in "
                "mfuUnavailable when the peak or the FLOP count is unknown).",
                [t(f"{opfamilies.JOB_MFU.name}{{{JOB_ONE}}}")],
                kind="gauge",
                unit="percentunit",
                min=0,
                max=1,
                w=4,
                h=5,
            ),
            Panel(
                "Time since last step",
                "Seconds since any rank finished a step (stall detection).",
                [t(f"time() - max({contract.LAST_STEP_TIMESTAMP.name}{{{JOB_ONE}}})")],
                kind="stat",
                unit="s",
                w=4,
                h=5,
            ),
        ],
    )
    steps = Row(
        "Step time",
        [
            Panel(
                "Step time breakdown per rank",
                "Seconds per step spent in each phase, per rank (stacked bars sum to the step "
                "time). Large data_wait: input bound; large comm_wait on fast ranks: a straggler "
                "or the network.",
                [
                    t(
                        f"sum by (rank, phase) (rate({contract.PHASE_SECONDS.name}"
                        f"{{{JOB_ONE}}}[{RATE}])) "
                        f"/ on (rank) group_left {steps_per_rank}",
                        "rank {{rank}} {{phase}}",
                    )
                ],
                unit="s",
                stack=True,
                w=12,
            ),
            Panel(
                "Share of time by phase",
                "Fraction of all ranks' time in each phase.",
                [
                    t(
                        f"sum by (phase) (rate({contract.PHASE_SECONDS.name}"
                        f"{{{JOB_ONE}}}[{RATE}])) "
                        "/ ignoring (phase) "
                        f"group_left sum(rate({contract.PHASE_SECONDS.name}{{{JOB_ONE}}}[{RATE}]))",
                        "{{phase}}",
                    )
                ],
                unit="percentunit",
                stack=True,
                min=0,
                max=1,
                w=12,
            ),
            Panel(
                "Step time per rank (p50, p95)",
                "Step time quantiles per rank from the histogram.",
                [
                    t(
                        f"histogram_quantile(0.5, sum by (rank, le) ({step_buckets}))",
                        "p50 rank {{rank}}",
                    ),
                    t(
                        f"histogram_quantile(0.95, sum by (rank, le) ({step_buckets}))",
                        "p95 rank {{rank}}",
                    ),
                ],
                unit="s",
                w=12,
            ),
            Panel(
                "Step time distribution",
                "How many steps took how long (all ranks), per bucket of the step time "
                "histogram: a second band is a periodic slow step (checkpoint, eval, a "
                "garbage collection), a wide smear is jitter.",
                [t(f"sum by (le) ({step_buckets})", "{{le}}", heatmap=True)],
                kind="heatmap",
                unit="s",
                options={"calculate": False, "yAxis": {"unit": "s"}, "cellGap": 1},
                w=12,
            ),
            Panel(
                "Job step time (p50, p95)",
                "The operator's median and p95 step time over its window "
                "(status.progress.stepSecondsP50/P95).",
                [
                    t(f"{opfamilies.JOB_STEP_P50.name}{{{JOB_ONE}}}", "p50"),
                    t(f"{opfamilies.JOB_STEP_P95.name}{{{JOB_ONE}}}", "p95"),
                ],
                unit="s",
                w=12,
            ),
            Panel(
                "Mean step time per rank",
                "Mean step time per rank over the rate interval.",
                [
                    t(
                        f"{_by_rank(contract.STEP_DURATION.name + '_sum')} / "
                        f"{_by_rank(contract.STEP_DURATION.name + '_count')}",
                        "rank {{rank}}",
                    )
                ],
                unit="s",
                w=12,
            ),
        ],
    )
    ranks = Row(
        "Ranks",
        [
            Panel(
                "Own time per step per rank",
                "Each rank's own work per step: the step minus its waits (data, exposed "
                "all-reduce) and checkpoint/eval, so a loss head, augmentation or metrics "
                "outside the model count too. The straggler signal: the fast ranks' waits "
                "would blame them.",
                [t(own_per_step, "rank {{rank}}")],
                unit="s",
                w=8,
            ),
            Panel(
                "Relative speed per rank",
                "Median rank's own time per step / this rank's (1 = typical). Below 0.75 "
                "(stragglerScore): a Straggler verdict names the rank.",
                [t(f"scalar(quantile(0.5, {own_per_step})) / {own_per_step}", "rank {{rank}}")],
                unit="percentunit",
                min=0,
                max=1,
                w=8,
            ),
            Panel(
                "Checkpoint and eval share",
                "Share of the time between steps spent in the checkpoint and eval phases, on "
                "the rank that spends most in each (the others wait for it). Above 10% "
                "(checkpointBoundRatio): CheckpointBound; above 15% (evalBoundRatio): EvalBound.",
                [t(outside_share, "{{phase}}")],
                unit="percentunit",
                min=0,
                max=1,
                w=8,
            ),
            Panel(
                "MFU per rank",
                "Each rank's model FLOP/s over its peak (the trainer's table for its GPU and "
                "precision; ranks without one are absent: see status.progress.mfuUnavailable). "
                "The job's figure in status also applies spec.monitoring.peakTFLOPSPerGPU and "
                "divides a DataParallel rank's FLOP/s by its GPUs.",
                [
                    t(
                        f"{_by_rank(contract.MODEL_FLOPS.name)} / on (rank) "
                        f"max by (rank) ({contract.PEAK_FLOPS.name}{{{JOB_ONE}}} > 0)",
                        "rank {{rank}}",
                    )
                ],
                unit="percentunit",
                min=0,
                max=1,
                w=8,
            ),
            Panel(
                "Host-to-device copy share",
                "Share of each rank's time spent copying batches to the GPU (the h2d phase). "
                "Above 20% (transferBoundRatio): TransferBound.",
                [
                    t(
                        f"sum by (rank) (rate({contract.PHASE_SECONDS.name}"
                        f'{{{JOB_ONE},phase="{contract.PHASE_H2D}"}}[{RATE}])) / on (rank) '
                        f"sum by (rank) (rate({contract.PHASE_SECONDS.name}{{{JOB_ONE}}}[{RATE}]))",
                        "rank {{rank}}",
                    )
                ],
                unit="percentunit",
                min=0,
                max=1,
                w=8,
            ),
            Panel(
                "Latest profile: where a step goes, per rank",
                "From the job's latest profile (gpujob profile, or spec.monitoring."
                "profileOnVerdict): each captured rank's mean seconds per step in compute, "
                "exposed communication, memory copies and idle, which add up to its step. "
                "status.profile names the slowest rank's differing operation; the ConfigMap "
                "it names holds every rank's top operations. Empty until a capture finished.",
                [
                    t(
                        f"max by (rank, part) ({contract.PROFILE_STEP_SECONDS.name}{{{JOB_ONE}}})",
                        "rank {{rank}} {{part}}",
                        instant=True,
                    )
                ],
                kind="bargauge",
                unit="s",
                w=8,
            ),
            Panel(
                "Samples/s per rank",
                "Samples consumed per second by each rank.",
                [t(_by_rank(contract.SAMPLES.name), "rank {{rank}}")],
                unit="suffix: samples/s",
                w=8,
            ),
            Panel(
                "Steps/s per rank",
                "Training steps per second by each rank.",
                [t(steps_per_rank, "rank {{rank}}")],
                unit="suffix: steps/s",
                w=8,
            ),
            Panel(
                "Loss",
                "Last reported training loss per rank.",
                [t(f"{contract.LOSS.name}{{{JOB_ONE}}}", "rank {{rank}}")],
                w=8,
            ),
            Panel(
                "Epoch",
                "Current epoch per rank.",
                [t(f"{contract.EPOCH.name}{{{JOB_ONE}}}", "rank {{rank}}")],
                w=8,
            ),
        ],
    )
    gpu_sel = JOB_ONE
    gpu_legend = "node {{node_rank}} gpu {{gpu}}"
    gpus = Row(
        "GPUs",
        [
            Panel(
                "GPU utilization",
                "Fraction of time a kernel ran, per GPU (NVML).",
                [t(f"{contract.GPU_UTILIZATION.name}{{{gpu_sel}}}", gpu_legend)],
                unit="percentunit",
                min=0,
                max=1,
                w=8,
            ),
            Panel(
                "GPU memory used",
                "Memory in use per GPU, and installed.",
                [
                    t(f"{contract.GPU_MEMORY_USED.name}{{{gpu_sel}}}", gpu_legend),
                    t(f"max({contract.GPU_MEMORY_TOTAL.name}{{{gpu_sel}}})", "installed"),
                ],
                unit="bytes",
                w=8,
            ),
            Panel(
                "CUDA allocator reserved",
                "Memory each rank's caching allocator holds (MemoryPressure).",
                [t(f"{contract.CUDA_MEMORY_RESERVED.name}{{{gpu_sel}}}", "rank {{rank}}")],
                unit="bytes",
                w=8,
            ),
            Panel(
                "Power",
                "Power draw per GPU and the enforced limit.",
                [
                    t(f"{contract.GPU_POWER.name}{{{gpu_sel}}}", gpu_legend),
                    t(f"max({contract.GPU_POWER_LIMIT.name}{{{gpu_sel}}})", "limit"),
                ],
                unit="watt",
                w=8,
            ),
            Panel(
                "Temperature",
                "GPU core temperature.",
                [t(f"{contract.GPU_TEMPERATURE.name}{{{gpu_sel}}}", gpu_legend)],
                unit="celsius",
                w=8,
            ),
            Panel(
                "SM clock",
                "Current SM clock per GPU; drops under throttling.",
                [t(f"{contract.GPU_SM_CLOCK.name}{{{gpu_sel}}}", gpu_legend)],
                unit="hertz",
                w=8,
            ),
            Panel(
                "Throttling",
                "1 while NVML reports a slowdown reason (power cap, thermal, hardware).",
                [
                    t(
                        f"max by (node_rank, gpu, reason) "
                        f'({contract.GPU_CLOCK_EVENT.name}{{{gpu_sel}, reason=~"{THROTTLE}"}})',
                        "node {{node_rank}} gpu {{gpu}} {{reason}}",
                    )
                ],
                min=0,
                max=1,
                w=8,
            ),
            Panel(
                "Allocator retries and OOMs",
                "cudaMalloc retries and OOMs per rank within the range.",
                [
                    t(
                        f"increase({contract.CUDA_ALLOC_RETRIES.name}{{{gpu_sel}}}[$__range])",
                        "retries rank {{rank}}",
                        instant=True,
                    ),
                    t(
                        f"increase({contract.CUDA_OOMS.name}{{{gpu_sel}}}[$__range])",
                        "OOMs rank {{rank}}",
                        instant=True,
                    ),
                ],
                kind="bargauge",
                w=8,
            ),
            Panel(
                "XID and uncorrected ECC errors",
                "Hardware faults per GPU; any is a reason to drain the node.",
                [
                    t(f"{contract.GPU_XID_ERRORS.name}{{{gpu_sel}}}", "XID " + gpu_legend),
                    t(f"{contract.GPU_ECC_UNCORRECTED.name}{{{gpu_sel}}}", "ECC " + gpu_legend),
                ],
                w=8,
            ),
            Panel(
                "PCIe traffic",
                "Bytes per second into (rx, host to device) and out of each GPU (NVML). "
                "Heavy rx while the SMs idle: TransferBound.",
                [
                    t(f"{contract.GPU_PCIE_RX.name}{{{gpu_sel}}}", "rx " + gpu_legend),
                    t(f"{contract.GPU_PCIE_TX.name}{{{gpu_sel}}}", "tx " + gpu_legend),
                ],
                unit="Bps",
                w=8,
            ),
            Panel(
                "SM and tensor activity",
                "Share of SMs busy and of cycles a tensor pipe worked (NVML GPM, Hopper and "
                "later): a busy GPU with idle tensor pipes is not doing matmuls.",
                [
                    t(f"{contract.GPU_SM_ACTIVE.name}{{{gpu_sel}}}", "SM " + gpu_legend),
                    t(f"{contract.GPU_TENSOR_ACTIVE.name}{{{gpu_sel}}}", "tensor " + gpu_legend),
                ],
                unit="percentunit",
                min=0,
                max=1,
                w=8,
            ),
            Panel(
                "Profiling counters",
                "1 when a node exports the PCIe or GPM counter group; 0 with the reason "
                "(not_supported, nvml_too_old).",
                [
                    t(
                        f"{contract.GPU_PROFILING_AVAILABLE.name}{{{gpu_sel}}}",
                        "node {{node_rank}} {{counter}} {{reason}}",
                    )
                ],
                min=0,
                max=1,
                w=8,
            ),
            Panel(
                "GPU telemetry",
                "1 when the node's NVML telemetry is exported; 0 with the reason.",
                [
                    t(
                        f"{contract.GPU_TELEMETRY_AVAILABLE.name}{{{gpu_sel}}}",
                        "node {{node_rank}} {{reason}}",
                    )
                ],
                min=0,
                max=1,
                w=24,
                h=5,
            ),
        ],
    )
    lost = opfamilies.JOB_LOST_GPU_SECONDS.name
    goodput = Row(
        "Goodput",
        [
            Panel(
                "Goodput",
                "Share of the job's GPU time since creation that made steps it kept "
                "(status.goodput.ratio).",
                [t(f"{opfamilies.JOB_GOODPUT.name}{{{JOB_ONE}}}")],
                kind="stat",
                unit="percentunit",
                min=0,
                max=1,
                w=6,
                h=8,
            ),
            Panel(
                "Lost GPU-hours by cause",
                "GPU-hours that made no kept step: queued, startup, restart (including "
                "recomputed steps), stall, checkpoint and eval.",
                [t(f"{lost}{{{JOB_ONE}}} / 3600", "{{cause}}", instant=True)],
                kind="bargauge",
                unit="suffix: GPU-h",
                w=9,
                h=8,
            ),
            Panel(
                "Lost GPU-hours over time",
                "The same, as it accumulates: a rising cause is where the job loses time now.",
                [t(f"{lost}{{{JOB_ONE}}} / 3600", "{{cause}}")],
                unit="suffix: GPU-h",
                stack=True,
                w=9,
                h=8,
            ),
        ],
    )
    ph = opfamilies.JOB_PHASE.name
    return dashboard(
        "gpujob-job",
        "gpujob / Job",
        "One GPUTrainingJob: goodput and lost GPU-hours by cause (from the operator), step "
        "time by phase per rank, stragglers, and every GPU (from the ranks' own /metrics, "
        "scraped by the chart's PodMonitor).",
        [overview, goodput, steps, ranks, gpus],
        [
            datasource_var(),
            query_var("namespace", "Namespace", f"label_values({ph}, namespace)", multi=False),
            query_var(
                "job", "Job", f'label_values({ph}{{namespace="$namespace"}}, job_name)', multi=False
            ),
        ],
        time_from="now-1h",
    )
