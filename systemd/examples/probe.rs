use capstan_systemd::bus::Bus;
use futures::StreamExt;
use std::time::{Duration, Instant};
#[tokio::main]
async fn main() {
    let pid = std::env::args().nth(1).unwrap();
    let addr = format!("unix:path=/proc/{pid}/root/run/dbus/system_bus_socket");
    let dir = format!("/proc/{pid}/root/run/systemd/system");
    let bus = Bus::connect(Some(&addr), Duration::from_secs(30))
        .await
        .unwrap();
    println!("version {}", bus.version().await.unwrap());
    let mut w = Box::pin(bus.watch().await.unwrap());
    tokio::spawn(async move {
        while let Some(c) = w.next().await {
            println!("change {c:?}");
        }
    });
    std::fs::write(format!("{dir}/capstan-p-a-r1.service"), "[Unit]\nStartLimitIntervalSec=10\nStartLimitBurst=3\n[Service]\nType=exec\nExecStart=/bin/sh -c 'sleep 0.2; exit 3'\nRestart=on-failure\nRestartSec=100ms\n").unwrap();
    std::fs::write(
        format!("{dir}/capstan-p-b-r1.service"),
        "[Service]\nType=exec\nExecStart=/nonexistent/x\n",
    )
    .unwrap();
    std::fs::write(
        format!("{dir}/capstan-p-c-r1.service"),
        "[Service]\nType=exec\nExecStart=/bin/sleep 100\n",
    )
    .unwrap();
    let g = bus.files_changed();
    let t = Instant::now();
    bus.reload_covering(g).await.unwrap();
    println!("reload {:?}", t.elapsed());
    let t = Instant::now();
    println!(
        "start c {:?} {:?}",
        bus.start("capstan-p-c-r1.service").await,
        t.elapsed()
    );
    println!("status c {:?}", bus.status("capstan-p-c-r1.service").await);
    println!(
        "start b {:?}",
        bus.start("capstan-p-b-r1.service")
            .await
            .map_err(|e| e.to_string())
    );
    println!("start a {:?}", bus.start("capstan-p-a-r1.service").await);
    tokio::time::sleep(Duration::from_secs(3)).await;
    println!("status a {:?}", bus.status("capstan-p-a-r1.service").await);
    println!(
        "status nx {:?}",
        bus.status("capstan-p-zz-r1.service").await
    );
    println!("ours {:?}", bus.list_ours().await);
    println!("stop c {:?}", bus.stop("capstan-p-c-r1.service").await);
    println!(
        "stop nx {:?}",
        bus.stop("capstan-p-zz-r1.service")
            .await
            .map_err(|e| format!("{e:?}"))
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
}
