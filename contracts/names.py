"""The names of every metric the agent exports and the extender queries: defined once, here.

The agent's exporter registers these names; the extender's ``prometheus`` profile source
queries them; ``docs/metrics.md`` is generated from :data:`METRICS`. Importing this module
imports nothing else of the agent.

Conventions (Prometheus naming): counters end in ``_total`` with the unit before it
(``_joules_total``); gauges carry their unit (``_watts``, ``_seconds``, ``_ratio``); source,
zone and domain are labels, never parts of a name.
"""

from __future__ import annotations

from dataclasses import dataclass

PREFIX = "joulesched"

# Label names (one spelling everywhere).
L_NODE = "node"
L_SOURCE = "source"  # rapl_sysfs, rapl_msr, ipmi_dcmi, ipmi_sdr, redfish, nvml
L_ZONE = "zone"  # package-0, dram-0, core-0, psys, gpu-0, chassis, ...
L_DOMAIN = "domain"  # cpu, dram, gpu, platform, idle
L_BASIS = "basis"  # which sources a node total stands on, e.g. "ipmi_dcmi+nvml"
L_NAMESPACE = "namespace"
L_POD = "pod"
L_IDLE_POLICY = "idle_policy"  # requests | bucket
L_SITE = "site"
L_SERVER_ID = "server_id"
L_DEVICE = "device"  # cpu | gpu-N
L_KIND = "kind"  # anomaly kind: negative, implausible, gap, garbage, reset
L_BUCKET = "bucket"  # idle (idle power not given to pods) | system (busy time of no pod)
L_PAIR = "pair"  # two sources compared, e.g. "rapl_sysfs/ipmi_dcmi"
L_VERB = "verb"  # extender verb
L_REASON = "reason"
L_ERROR = "error"  # a source's last error message (one series per source at a time)
L_OWNER_KIND = "owner_kind"
L_OWNER = "owner"
L_WORKFLOW_RUN = "workflow_run"  # recording rules: Nextflow run name (pod label nextflow.io/runName)
L_WORKFLOW_PROCESS = "workflow_process"  # recording rules: Nextflow process (nextflow.io/processName)

# Node label naming a node's site (a key of the site file's ``sites``). The deferrer reads a pod's
# site from a nodeSelector or required node affinity on it; a pod without one may run anywhere.
SITE_LABEL = "joulesched.io/site"


@dataclass(frozen=True)
class Metric:
    name: str
    type: str  # counter | gauge | histogram | info
    help: str
    labels: tuple[str, ...]


def _m(name: str, type_: str, help_: str, *labels: str) -> Metric:
    return Metric(f"{PREFIX}_{name}", type_, help_, labels)


# --- agent: energy and power ----------------------------------------------------------------
NODE_ENERGY = _m(
    "node_energy_joules_total",
    "counter",
    "Energy measured by one source and zone of the node, wrap-corrected, since the agent started.",
    L_NODE,
    L_SOURCE,
    L_ZONE,
)
NODE_ENERGY_ESTIMATED = _m(
    "node_energy_estimated_joules_total",
    "counter",
    "Energy of one source and zone estimated (its power model over the CPU time measured) for intervals it could"
    " not measure; not part of node_energy_joules_total. Node, domain and pod totals include it.",
    L_NODE,
    L_SOURCE,
    L_ZONE,
)
NODE_POWER = _m(
    "node_power_watts",
    "gauge",
    "Power of one source and zone: its energy change over the agent's power window (10 s by default), at most the"
    " zone's maximum; absent while the zone is not read.",
    L_NODE,
    L_SOURCE,
    L_ZONE,
)
NODE_PLATFORM_ENERGY = _m(
    "node_platform_energy_joules_total",
    "counter",
    "Whole-node energy from the most complete sources present (basis names them).",
    L_NODE,
    L_BASIS,
)
NODE_PLATFORM_POWER = _m(
    "node_platform_power_watts",
    "gauge",
    "Whole-node power: the node energy's change over the agent's power window; absent while a source of the basis"
    " is not read.",
    L_NODE,
    L_BASIS,
)
NODE_DOMAIN_ENERGY = _m(
    "node_domain_energy_joules_total",
    "counter",
    "Node energy split by domain (cpu, dram, gpu, other).",
    L_NODE,
    L_DOMAIN,
)
POD_ENERGY = _m(
    "pod_energy_joules_total",
    "counter",
    "Energy attributed to a pod, by domain; idle_policy says how idle power was shared.",
    L_NODE,
    L_NAMESPACE,
    L_POD,
    L_DOMAIN,
    L_IDLE_POLICY,
)
IDLE_ENERGY = _m(
    "node_unattributed_energy_joules_total",
    "counter",
    "Node energy attributed to no pod (idle bucket and system processes), by domain.",
    L_NODE,
    L_DOMAIN,
    L_IDLE_POLICY,
    L_BUCKET,
)
POD_CPU_SECONDS = _m(
    "pod_cpu_seconds_total",
    "counter",
    "CPU time of a pod's cgroup seen by the agent since it started.",
    L_NODE,
    L_NAMESPACE,
    L_POD,
)
NODE_CPU_SECONDS = _m(
    "node_cpu_busy_seconds_total", "counter", "Busy CPU time of the node (/proc/stat) since the agent started.", L_NODE
)
OWNER_CPU_CORES = _m(
    "owner_cpu_cores",
    "gauge",
    "Observed mean CPU cores per pod of an owner (Deployment, Job, workflow process).",
    L_NAMESPACE,
    L_OWNER_KIND,
    L_OWNER,
)

# --- agent: the node's profile (what the extender's policy consumes) -------------------------
NODE_CPU_CORES = _m("node_cpu_cores", "gauge", "Logical CPUs of the node.", L_NODE)
NODE_CPU_UTILISATION = _m(
    "node_cpu_utilisation_ratio",
    "gauge",
    "CPU utilisation of the node over the last interval, 0..1; absent before the first interval and for one the "
    "clock did not advance over.",
    L_NODE,
)
MODEL_IDLE = _m(
    "node_power_model_idle_watts", "gauge", "Fitted idle power P(0) of the node's power model.", L_NODE, L_DEVICE
)
MODEL_PER_CORE = _m(
    "node_power_model_watts_per_core",
    "gauge",
    "Fitted watts per fully busy core (CPU) or per busy GPU.",
    L_NODE,
    L_DEVICE,
)
MODEL_R2 = _m(
    "node_power_model_r2_ratio", "gauge", "Coefficient of determination of the power model fit.", L_NODE, L_DEVICE
)
MODEL_SAMPLES = _m(
    "node_power_model_samples", "gauge", "Samples in the power model's fitting window.", L_NODE, L_DEVICE
)
NODE_SPEED = _m("node_relative_speed_ratio", "gauge", "Relative throughput per core of the node (reference 1).", L_NODE)
NODE_POWER_CAP = _m("node_power_cap_watts", "gauge", "Power cap of the node.", L_NODE)
# Exported as joulesched_node_gpus: a "_count" suffix is reserved for histograms and summaries
# (promtool check metrics rejects it). The Python name stays, so code using the constant is unaffected.
NODE_GPU_COUNT = _m("node_gpus", "gauge", "GPUs of the node.", L_NODE)
NODE_GPU_MAX = _m("node_gpu_max_watts", "gauge", "Power limit per GPU of the node.", L_NODE)
NODE_GPU_IDLE = _m("node_gpu_idle_watts", "gauge", "Fitted idle power per GPU of the node (their mean).", L_NODE)
NODE_GPU_UTILISATION = _m(
    "node_gpu_utilisation_ratio",
    "gauge",
    "Mean GPU utilisation of the node, 0..1; absent while a GPU's utilisation is not measured (its query failed, or "
    "no source reports it).",
    L_NODE,
)
NODE_INFO = _m(
    "node_info", "gauge", "Constant 1; labels name the node's site and physical server.", L_NODE, L_SITE, L_SERVER_ID
)

# --- site factors ------------------------------------------------------------------------------
SITE_PUE = _m("site_pue_ratio", "gauge", "Power usage effectiveness of the site.", L_SITE)
SITE_CARBON = _m("site_grid_carbon_intensity_grams_per_kwh", "gauge", "Grid carbon intensity at the site now, gCO2e/kWh.", L_SITE)
SITE_CARBON_AGE = _m(
    "site_grid_carbon_intensity_age_seconds",
    "gauge",
    "Seconds since the site's carbon-intensity API last answered (sites with a carbon_api; +Inf before the first answer). "
    "Past the source's max_age_s the intensity gauge shows the site's fallback, or is absent without one.",
    L_SITE,
)
SITE_WUE = _m("site_wue_litres_per_kwh", "gauge", "Water usage effectiveness of the site, litres per kWh.", L_SITE)
SITE_RENEWABLE = _m("site_renewable_share_ratio", "gauge", "Renewable share of the site's electricity, 0..1.", L_SITE)

# --- server factors: embodied emissions, joined to nodes through node_info's server_id -------------
SERVER_EMBODIED = _m(
    "server_embodied_emissions_grams",
    "gauge",
    "Embodied emissions of the physical server over its life (manufacture, transport, end of life), gCO2e.",
    L_SERVER_ID,
)
SERVER_LIFETIME = _m(
    "server_lifetime_seconds",
    "gauge",
    "Service life over which the server's embodied emissions are amortised.",
    L_SERVER_ID,
)

# --- agent: health -----------------------------------------------------------------------------
SOURCE_UP = _m(
    "source_up",
    "gauge",
    "1 when the last read of the source succeeded; 0 while it fails, or failed to open and is being retried.",
    L_SOURCE,
)
SOURCE_ERROR = _m(
    "source_error_info",
    "gauge",
    "Constant 1 while the source has an error (a failed read or opening, or a zone whose parent still reads);"
    " the error label is its last message. Absent while the source reads cleanly.",
    L_SOURCE,
    L_ERROR,
)
SOURCE_READ_SECONDS = _m("source_read_duration_seconds", "histogram", "Time to read one source.", L_SOURCE)
ANOMALIES = _m(
    "energy_anomalies_total", "counter", "Energy deltas dropped as implausible, by kind.", L_SOURCE, L_ZONE, L_KIND
)
DISCARDED_SECONDS = _m(
    "energy_discarded_seconds_total",
    "counter",
    "Time whose energy a zone could not count (the intervals dropped as anomalies), by kind.",
    L_SOURCE,
    L_ZONE,
    L_KIND,
)
ESTIMATED_SECONDS = _m(
    "energy_estimated_seconds_total",
    "counter",
    "Time whose energy a zone could not measure and the agent estimated instead (the anomalies), by kind.",
    L_SOURCE,
    L_ZONE,
    L_KIND,
)
SOURCE_RATIO = _m(
    "source_agreement_ratio", "gauge", "Ratio of two sources measuring the same thing (e.g. rapl/ipmi).", L_NODE, L_PAIR
)
SOURCE_ERRORS = _m("source_read_errors_total", "counter", "Failed reads of a source's zones.", L_SOURCE)
WINDOWS_OPEN = _m("measurement_windows_open", "gauge", "Measurement windows open now (POST /v1/windows).", L_NODE)
CLOCK_STEP = _m(
    "agent_clock_step_seconds",
    "gauge",
    "How far the system clock has been stepped since the agent started (intervals are timed on the monotonic clock).",
    L_NODE,
)

# --- extender ----------------------------------------------------------------------------------
EXT_REQUESTS = _m(
    "extender_requests_total", "counter", "Extender requests by verb and HTTP status code.", L_VERB, "code"
)
EXT_LATENCY = _m(
    "extender_request_duration_seconds",
    "histogram",
    "Time from the verb endpoint taking a POST to an extender verb to its answer being ready to send, by verb "
    "(unknown: a verb it does not know); answers with an error (bad input, body too large, bind disabled, "
    "internal) included. Requests refused before the endpoint takes them (a wrong method or path, the HTTP "
    "worker's refusals) and those whose client had gone (code 499) are not observed.",
    L_VERB,
)
EXT_FAILURES = _m(
    "extender_failures_total",
    "counter",
    "Requests answered with an error (bad input or internal), by verb and reason.",
    L_VERB,
    L_REASON,
)
EXT_NODE_SCORE = _m("extender_node_score", "gauge", "Last score given to the node (0..10).", L_NODE)
EXT_MARGINAL_WATTS = _m("extender_node_marginal_watts", "gauge", "Last estimated marginal watts of a pod on the node.", L_NODE)
EXT_DATA_AGE = _m("extender_profile_age_seconds", "gauge", "Seconds since the profile source last answered: the age of the node profiles used for scoring.")
EXT_PROFILES = _m(
    "extender_profiles", "gauge", "Node profiles the source serves, by state (fresh; stale: measured longer ago than policy.max_age_seconds, scored neutral).", "state"
)
EXT_NEUTRAL = _m(
    "extender_neutral_scores_total",
    "counter",
    "Nodes given the neutral score, by why (unknown, stale, invalid: a profile sample not finite or out of range).",
    L_REASON,
)
EXT_SOURCE_ERRORS = _m(
    "extender_profile_source_errors_total", "counter", "Failed refreshes of the profile source.", L_SOURCE
)
EXT_PREDICTED_PODS = _m(
    "extender_predicted_pods", "gauge", "Pods counted as predicted load (placed, not yet measured)."
)
EXT_FILTERED = _m("extender_filtered_nodes_total", "counter", "Nodes failed by filter, by reason.", L_REASON)
EXT_FILTER_KEPT = _m(
    "extender_filter_answers_total",
    "counter",
    "Filter answers that kept a node, by what they kept: best (the one node the extender ranks first, where "
    "kube-scheduler places the pod), top (the nodes it ranks first, for kube-scheduler's plugins to choose among), "
    "all (every node the power cap passes: policy.filter_keeps all, or top or best with no node of fresh "
    "measurements ranked first).",
    "kept",
)
EXT_BIND_WAITS = _m(
    "extender_bind_waits_total",
    "counter",
    "Decisions that waited for the bindings of pods answered before them (bind verb), by outcome "
    "(bound: they came; deadline: bind.wait_seconds passed first, and the pods still unbound were dropped).",
    "outcome",
)
EXT_BIND_WAIT_SECONDS = _m(
    "extender_bind_wait_seconds_total",
    "counter",
    "Seconds decisions spent waiting for the bindings of pods answered before them (bind verb), by outcome "
    "as in extender_bind_waits_total: time on kube-scheduler's scheduling cycle that no CPU is spent in.",
    "outcome",
)
EXT_BINDS_IN_FLIGHT = _m(
    "extender_binds_in_flight",
    "gauge",
    "Bindings the bind verb has sent to the API server and not yet had answered; each holds one of bind.threads "
    "(at bind.threads, the next binds wait for a thread).",
)
EXT_CONNECTIONS = _m(
    "extender_connections_total",
    "counter",
    "TCP connections the worker accepted. kube-scheduler keeps at most 2 idle connections to an extender: "
    "requests in flight beyond those (binds overlapping the next pod's filter) come on new ones, closed after.",
)

# --- deferrer (joulesched deferrer: carbon-aware deferral through scheduling gates) --------------
DEFER_HELD = _m("deferrer_pods_held", "gauge", "Pods carrying the joulesched.io/deferred gate that this replica holds.")
DEFER_RELEASED = _m(
    "deferrer_released_total",
    "counter",
    "Gates removed, by reason: clean (now is in the cleanest part of the window), deadline (latest start reached), "
    "expired (deadline passed or runtime does not fit), no_forecast, invalid (malformed annotations).",
    L_REASON,
)
DEFER_AVOIDED = _m(
    "deferrer_avoided_grams_total",
    "counter",
    "Estimated gCO2e avoided by waiting: (mean intensity of the run had it started at submission - at its release) "
    "x the pod's estimated energy (requested cores x watts per core x PUE x expected runtime).",
)
DEFER_ADDED = _m(
    "deferrer_added_grams_total",
    "counter",
    "Estimated gCO2e added by waiting, where the run at release is dirtier than at submission (a deadline release "
    "into a dirtier hour); net saving = avoided - added.",
)
DEFER_MISSED = _m(
    "deferrer_deadlines_missed_total",
    "counter",
    "Pods released more than one interval after their latest start (deadline - expected runtime); must stay 0.",
)
DEFER_ERRORS = _m("deferrer_errors_total", "counter", "Failed API calls (api), lost races (conflict) and failed forecasts.", L_REASON)
DEFER_LEADER = _m("deferrer_leader", "gauge", "1 while this replica holds the deferrer's Lease, 0 on standby.")
# --- every long-running process (agent, extender) --------------------------------------------
BUILD_INFO = _m(
    "build_info",
    "gauge",
    "Constant 1; labels name the joulesched version, the git revision the image was built from and the Python version.",
    "version",
    "revision",
    "python_version",
)

METRICS: tuple[Metric, ...] = tuple(v for v in list(globals().values()) if isinstance(v, Metric))
