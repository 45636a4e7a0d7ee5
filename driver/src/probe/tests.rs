use super::*;
use tokio::net::TcpListener;

const SECOND: Duration = Duration::from_secs(5);

/// A server on loopback that answers each connection with `reply` and closes.
async fn serving(reply: &'static [u8]) -> (u16, tokio::task::JoinHandle<Vec<u8>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let served = tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        let mut request = Vec::new();
        let mut buf = [0u8; 512];
        while !request.ends_with(b"\r\n\r\n") {
            let n = s.read(&mut buf).await.unwrap();
            assert!(n > 0, "the probe closed before its request ended");
            request.extend_from_slice(&buf[..n]);
        }
        s.write_all(reply).await.unwrap();
        request
    });
    (port, served)
}

fn http_check(port: u16, path: &str) -> Check {
    Check::Http {
        port,
        path: path.into(),
    }
}

const LOOPBACK: IpAddr = IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);

#[tokio::test]
async fn an_http_probe_sends_one_get_of_the_path_and_passes_on_2xx_and_3xx_only() {
    for (reply, ready) in [
        (&b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"[..], true),
        (b"HTTP/1.0 302 Found\r\n\r\n", true),
        (b"HTTP/1.1 199 Early\r\n\r\n", false),
        (b"HTTP/1.1 404 Not Found\r\n\r\n", false),
        (b"HTTP/1.1 503 Service Unavailable\r\n\r\n", false),
        (b"SSH-2.0-OpenSSH_9.6\r\n", false),
        (b"HTTP/1.1 2000 OK\r\n\r\n", false),
    ] {
        let (port, served) = serving(reply).await;
        let probe = network(LOOPBACK, &http_check(port, "/healthz?x=1"), SECOND).await;
        let request = served.await.unwrap();
        assert_eq!(
            probe.unwrap().is_ready(),
            ready,
            "{:?}",
            String::from_utf8_lossy(reply)
        );
        let request = String::from_utf8(request).unwrap();
        assert!(
            request.starts_with("GET /healthz?x=1 HTTP/1.1\r\nHost: 127.0.0.1:"),
            "{request}"
        );
    }
}

#[tokio::test]
async fn a_probe_of_a_closed_port_or_a_silent_server_is_not_ready_within_its_timeout() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    // Accepted by the kernel, never answered.
    let silent = network(LOOPBACK, &http_check(port, "/"), Duration::from_millis(200)).await;
    assert!(
        matches!(&silent, Some(Probe::NotReady(why)) if why.contains("200 ms")),
        "{silent:?}"
    );
    drop(listener);
    for check in [Check::Tcp { port }, http_check(port, "/")] {
        let closed = network(LOOPBACK, &check, SECOND).await;
        assert!(
            matches!(&closed, Some(Probe::NotReady(why)) if why.contains("connect")),
            "{closed:?}"
        );
    }
}

#[tokio::test]
async fn a_tcp_probe_passes_once_something_listens_and_exec_is_not_a_network_probe() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    assert_eq!(
        network(LOOPBACK, &Check::Tcp { port }, SECOND).await,
        Some(Probe::Ready)
    );
    let exec = Check::Exec {
        command: vec!["true".into()],
    };
    assert_eq!(network(LOOPBACK, &exec, SECOND).await, None);
}
