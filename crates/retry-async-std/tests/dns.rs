//! SRV-2..SRV-5 through hickory on async-io, against a DNS server on 127.0.0.1.

use retry_async_std::AsyncIoRuntime;
use retry_driver::Runtime;

fn runtime(nameservers: retry_driver::Nameservers) -> AsyncIoRuntime {
    AsyncIoRuntime::start()
        .expect("async-io always starts")
        .with_nameservers(nameservers)
}

#[test]
fn srv_seedlist_through_a_dns_server_on_async_std() {
    async_std::task::block_on(retry_scenarios::srv_seedlist_through_a_dns_server(runtime));
}

#[test]
fn srv_seedlist_through_a_dns_server_on_smol() {
    smol::block_on(retry_scenarios::srv_seedlist_through_a_dns_server(runtime));
}

#[test]
fn srv_polling_follows_the_records_on_async_std() {
    async_std::task::block_on(retry_scenarios::srv_polling_follows_the_records(runtime));
}
