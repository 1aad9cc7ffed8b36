//! SRV-2..SRV-5 through hickory on tokio, against a DNS server on 127.0.0.1.

use retry_driver::Runtime;
use retry_tokio::TokioRuntime;

#[tokio::test]
async fn srv_seedlist_through_a_dns_server_on_tokio() {
    retry_scenarios::srv_seedlist_through_a_dns_server(|nameservers| {
        TokioRuntime::start()
            .expect("inside a tokio runtime")
            .with_nameservers(nameservers)
    })
    .await;
}

#[tokio::test]
async fn srv_polling_follows_the_records_on_tokio() {
    retry_scenarios::srv_polling_follows_the_records(|nameservers| {
        TokioRuntime::start()
            .expect("inside a tokio runtime")
            .with_nameservers(nameservers)
    })
    .await;
}
