"""The rendezvous doctor's socket interface choice from recorded probes."""


def test_node_interface_from_recorded_probes():
    from fluidctl.backends.ssh import doctor
    a = {"lo": [["127.0.0.1", "255.0.0.0"]], "eth0": [["10.0.0.5", "255.255.255.0"]]}
    b = {"lo": [["127.0.0.1", "255.0.0.0"]], "ens3": [["10.0.0.6", "255.255.255.0"]]}
    assert doctor.node_interface("10.0.0.5", a) == "eth0"
    assert doctor.node_interface("127.0.0.3", a) == "lo"
    assert doctor.socket_ifnames(["10.0.0.5", "10.0.0.6"], [a, b]) \
        == "eth0,ens3"
    assert doctor.socket_ifnames(["10.0.0.5", "192.168.1.1"],
                                 [a, b]) is None
