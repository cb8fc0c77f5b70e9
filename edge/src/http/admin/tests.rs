use super::*;
use crate::core::residency::Residency;

/// Issue 29: the residency fields of `/admin/v1/providers`.
#[test]
fn residency_fields_as_the_contract_says() {
    let fields = |figures: Figures| {
        let (last_load_seconds, last_load_at) = last_load(&figures);
        json!({
            "id": "p",
            "residency": admin::Residency::from(figures.residency),
            "model_memory": model_memory(&figures),
            "last_load_seconds": last_load_seconds,
            "last_load_at": last_load_at,
        })
    };
    assert_eq!(
        fields(Figures::UNKNOWN),
        json!({ "id": "p", "residency": "unknown", "model_memory": null, "last_load_seconds": null, "last_load_at": null })
    );
    let loaded = Figures {
        residency: Residency::Loaded,
        size_bytes: 42_000_000_000,
        vram_bytes: 41_000_000_000,
        last_load_ms: 18_250,
        last_loaded_at_unix_ms: 1_764_825_600_123,
        continues_prefill: false,
        context_window: 0,
        prefill_ms_per_1k_tokens: 0,
        learned_stall_ms: 0,
        images: None,
    };
    assert_eq!(
        fields(loaded),
        json!({
            "id": "p",
            "residency": "loaded",
            "model_memory": { "size_bytes": 42_000_000_000u64, "vram_bytes": 41_000_000_000u64 },
            "last_load_seconds": 18.25,
            "last_load_at": "2025-12-04T05:20:00.123Z",
        })
    );
    let cold = Figures { residency: Residency::NotLoaded, vram_bytes: 1, ..Figures::UNKNOWN };
    let value = fields(cold);
    assert_eq!(value["residency"], "not_loaded");
    assert_eq!(value["model_memory"], json!({ "size_bytes": 0, "vram_bytes": 1 }), "null only when both are 0");
}
