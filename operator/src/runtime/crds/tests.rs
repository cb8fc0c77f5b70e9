//! Waiting for the CRDs, with tokio's paused clock: each definition is read
//! by name, every `poll`, until `deadline`.

use serde_json::{Value, json};

use super::*;
use crate::runtime::tests::{ApiServer, mock};

const PATH: &str = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions";
const CONFIG: WaitConfig = WaitConfig { poll: Duration::from_millis(500), deadline: Duration::from_secs(2) };

fn crd_json(name: &str, established: Option<&str>) -> Value {
    let crd = crd::all().into_iter().find(|c| c.metadata.name.as_deref() == Some(name)).unwrap();
    let mut value = serde_json::to_value(crd).unwrap();
    if let Some(status) = established {
        value["status"] = json!({"conditions": [
            {"type": "NamesAccepted", "status": "True"},
            {"type": "Established", "status": status}
        ]});
    }
    value
}

async fn serve(server: &mut ApiServer, name: &str, established: Option<&str>) {
    let call = server.expect("GET", &format!("{PATH}/{name}"), &[]).await;
    call.respond(200, crd_json(name, established));
}

#[test]
fn the_three_names_the_chart_grants() {
    // charts/iop/templates/rbac.yaml: resourceNames of the ClusterRole.
    assert_eq!(names(), ["nodecatalogs.iop.dev", "providers.iop.dev", "workspacetemplates.iop.dev"]);
}

#[tokio::test(start_paused = true)]
async fn returns_once_every_crd_is_established() {
    let (client, mut server) = mock();
    let task = tokio::spawn(async move { wait_established(&client, CONFIG).await });
    let started = Instant::now();
    serve(&mut server, "nodecatalogs.iop.dev", Some("True")).await;
    serve(&mut server, "providers.iop.dev", Some("False")).await;
    server.expect("GET", &format!("{PATH}/workspacetemplates.iop.dev"), &[]).await.not_found();
    // Only the two that were not ready are read again, one poll later.
    serve(&mut server, "providers.iop.dev", None).await;
    serve(&mut server, "workspacetemplates.iop.dev", Some("True")).await;
    assert_eq!(Instant::now() - started, CONFIG.poll);
    serve(&mut server, "providers.iop.dev", Some("True")).await;
    task.await.unwrap().unwrap();
    server.done().await;
}

#[tokio::test(start_paused = true)]
async fn gives_up_after_the_deadline_with_an_install_hint() {
    let (client, mut server) = mock();
    let task = tokio::spawn(async move { wait_established(&client, CONFIG).await });
    let started = Instant::now();
    serve(&mut server, "nodecatalogs.iop.dev", None).await;
    serve(&mut server, "providers.iop.dev", Some("True")).await;
    server.expect("GET", &format!("{PATH}/workspacetemplates.iop.dev"), &[]).await.not_found();
    // Polls at 0.5, 1.0, 1.5 and 2.0 s read only the two missing ones; the last one gives up.
    for _ in 0..4 {
        serve(&mut server, "nodecatalogs.iop.dev", None).await;
        server.expect("GET", &format!("{PATH}/workspacetemplates.iop.dev"), &[]).await.not_found();
    }
    let e = task.await.unwrap().unwrap_err();
    assert_eq!(Instant::now() - started, CONFIG.deadline);
    let message = e.to_string();
    assert_eq!(e.label(), "crds_not_established");
    assert!(message.contains("kubectl apply -f crds/"), "{message}");
    assert!(message.contains("nodecatalogs.iop.dev (not established)"), "{message}");
    assert!(message.contains("workspacetemplates.iop.dev (not installed)"), "{message}");
    assert!(!message.contains("providers.iop.dev"), "{message}");
    server.done().await;
}

#[tokio::test(start_paused = true)]
async fn forbidden_fails_at_once() {
    let (client, mut server) = mock();
    let task = tokio::spawn(async move { wait_established(&client, CONFIG).await });
    server.expect("GET", &format!("{PATH}/nodecatalogs.iop.dev"), &[]).await.fail(403, "Forbidden");
    let e = task.await.unwrap().unwrap_err();
    assert_eq!(e.label(), "kube");
    server.done().await;
}
