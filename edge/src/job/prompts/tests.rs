use super::*;

#[test]
fn templates_replace_stage_prompts_and_repairs_get_the_notes() {
    let overrides = StagePrompts { review: Some("Be strict.".into()), ..Default::default() };
    assert_eq!(instruction(Stage::Reviewing, &overrides, None), "Be strict.");
    assert_eq!(instruction(Stage::Planning, &overrides, None), PLAN);
    assert!(instruction(Stage::Repairing, &overrides, Some("fix the title")).ends_with("Review notes: fix the title"));
    assert_eq!(instruction(Stage::Repairing, &overrides, Some("")), REPAIR);
}
